"""Dedupe: each distinct text is sent once per run, and never when any store has paid for it already."""
