"""docs/library.md's EmbedTexts example, run as written, on Prism and on the local runner.

The example's `beam.Pipeline()` has no options: Beam's DirectRunner then runs it on Prism when
it finds Prism's release archive in its cache (~/.apache_beam/cache/prism/bin/; Beam downloads it
there when it can), else on its local runner. The Prism side gets that archive, made from `make
prism`'s binary, in a home directory of its own: the user's default path, not a flag of ours."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

from apache_beam.runners.portability.prism_runner import PrismJobServer
from apache_beam.version import __version__ as beam_version

from service.sandbox.store import read_ledger
from tests.library.test_docs_examples import examples
from tests.prism.twin import env_for

STARTED_PRISM = "Really starting service"   # Beam's line when it starts a job server's binary


def beam_cache_with_prism(home: Path, binary: str) -> None:
    """Prism's release archive where Beam looks before downloading it."""
    url = PrismJobServer._construct_download_url(f"v{beam_version}", f"v{beam_version}", platform.system(),
                                                 platform.machine())
    cache = home / ".apache_beam" / "cache" / "prism" / "bin"
    cache.mkdir(parents=True)
    name = url.rsplit("/", 1)[1]
    with zipfile.ZipFile(cache / name, "w", zipfile.ZIP_STORED) as z:
        z.write(binary, name.removesuffix(".zip"))


def run_example(name: str, home: Path, sandbox, key: str, cwd: Path) -> tuple[dict, str]:
    cwd.mkdir()
    env = env_for(key, HOME=str(home), BASE_URL=sandbox.base_url)
    done = subprocess.run([sys.executable, "-c", examples()[name]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {f.name: sorted(f.read_text().splitlines()) for f in sorted((cwd / "out").glob("*.jsonl"))}
    return {"lines": {name.split("-")[0]: rows for name, rows in lines.items()},
            "ledger": [(c["input_sha256"], c["cost_rub"], c["total_tokens"]) for c in read_ledger(sandbox.db)]}, \
        done.stderr


def test_embed_texts_example(tmp_path, sandbox_factory, leak_key, prism_binary):
    prism_home, plain_home = tmp_path / "prism-home", tmp_path / "plain-home"
    beam_cache_with_prism(prism_home, prism_binary)
    plain_home.mkdir()
    on_prism, said = run_example("embed_texts", prism_home, sandbox_factory(key=leak_key, balance=1000.0), leak_key,
                                 tmp_path / "prism")
    assert STARTED_PRISM in said and "prism" in said.split(STARTED_PRISM, 1)[1].splitlines()[0]
    local, said_locally = run_example("embed_texts", plain_home, sandbox_factory(key=leak_key, balance=1000.0),
                                      leak_key, tmp_path / "local")
    assert STARTED_PRISM not in said_locally
    assert on_prism == local
    vectors = [json.loads(line) for line in on_prism["lines"]["vectors"]]
    assert sorted(v["id"] for v in vectors) == ["a", "b", "d"] and len(on_prism["ledger"]) == 1
    assert leak_key not in said
