"""Money in the driver: the account, whether a run fits, the reconciliation over DIR's history."""
