"""Hints where a user typed almost the right thing: a base URL without its `/v1`, a model name
a letter off (service/catalog.py names the nearest), and the base URL DIR's last run used,
remembered for `search` (never a key: a base URL with credentials is refused before any
request, and one with a query or a fragment, where a key could hide, is not remembered)."""
from __future__ import annotations

from urllib.parse import urlsplit

from pipeline.exits import UsageError
from service import errors
from service.client import EmbeddingsClient

API_PATH = "/v1"   # where OpenAI-style services serve their API, under the host


def not_found(client: EmbeddingsClient, exc: errors.NotFoundError) -> UsageError:
    """The one line for a 404 from CLIENT's service: when its base URL lacks /v1 and the same
    account endpoint answers under it (anything but a 404: nothing is billed for it), that URL."""
    where = f"{client.base_url}/{client.account_segment}/balance"
    parts = urlsplit(client.base_url)
    if not parts.path.endswith(API_PATH):
        candidates = dict.fromkeys([client.base_url + API_PATH, f"{parts.scheme}://{parts.netloc}{API_PATH}"])
        for fixed in candidates:
            if _answers(client, fixed):
                return UsageError(f"--base-url {client.base_url}: 404 at {where}, and {fixed} answers: "
                                  f"pass --base-url {fixed}")
    return UsageError(f"--base-url {client.base_url}: 404 at {where} ({exc.message}): check --base-url (an "
                      f"OpenAI-style service's ends in {API_PATH}) and --account-segment ({client.account_segment})")


def _answers(client: EmbeddingsClient, base_url: str) -> bool:
    with client.at(base_url) as probe:
        try:
            probe.balance()
        except errors.NotFoundError:
            return False
        except errors.EmbeddingsError as exc:   # 401, 429, a 5xx...: something serves that path
            return exc.status is not None
    return True


def remembered(base_url: str | None) -> str | None:
    """BASE_URL as DIR may keep it for the next command, or None when it should not be kept."""
    if not base_url:
        return None
    parts = urlsplit(base_url)
    if parts.username or parts.password or parts.query or parts.fragment:
        return None
    return base_url.rstrip("/")
