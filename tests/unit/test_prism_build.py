"""`make prism` (tools/prism.py) on a Beam version its patch does not fit: a hunk that does not
apply, or a listener in Prism's source the patch does not bind, fails the build in one line
naming the file; a binary built with another patch, or with none, is not taken as installed.
The real patch on the real source: `make prism` itself, and tests/prism/test_loopback.py."""
from __future__ import annotations

import pytest

from tools import prism

PATCH = """Header lines, as the real patch's, which git apply skips.

diff --git a/go/x.go b/go/x.go
--- a/go/x.go
+++ b/go/x.go
@@ -1,3 +1,3 @@
 package x
-var host = ""
+var host = "127.0.0.1"
 // end
"""


@pytest.fixture
def patch(tmp_path, monkeypatch):
    path = tmp_path / "bind.patch"
    path.write_text(PATCH)
    monkeypatch.setattr(prism, "PATCH", path)
    return path


def _source(tmp_path, text: str):
    src = tmp_path / "src"
    (src / "go").mkdir(parents=True)
    (src / "go" / "x.go").write_text(text)
    return src


def test_the_patch_applies_where_its_context_is_exactly_as_it_says(tmp_path, patch):
    src = _source(tmp_path, 'package x\nvar host = ""\n// end\n')
    prism._apply(src, "9.9.9")
    assert 'var host = "127.0.0.1"' in (src / "go" / "x.go").read_text()


def test_a_version_the_patch_does_not_fit_fails_in_one_line_naming_the_file(tmp_path, patch):
    src = _source(tmp_path, 'package x\nvar host = "::"\n// end\n')   # the next version changed the line
    with pytest.raises(SystemExit) as stopped:
        prism._apply(src, "9.9.9")
    message = str(stopped.value)
    assert "\n" not in message and "does not apply to Prism of Beam 9.9.9 (go/x.go)" in message, message
    assert 'var host = "::"' in (src / "go" / "x.go").read_text()   # nothing half-applied


def _tree(tmp_path, extra: dict[str, str]):
    src = tmp_path / "src"
    for (file, line) in prism.LISTENERS:
        (src / file).parent.mkdir(parents=True, exist_ok=True)
        (src / file).write_text(f"package p\n\nfunc f() {{\n\t{line}\n}}\n")
    for file, text in extra.items():
        (src / file).parent.mkdir(parents=True, exist_ok=True)
        (src / file).write_text(text)
    return src


def test_the_listeners_the_patch_binds_pass(tmp_path):
    src = _tree(tmp_path, {"go/pkg/beam/runners/prism/internal/worker/pool_test.go":   # tests are not built
                           'lis, _ := net.Listen("tcp", ":0")\n',
                           "go/pkg/beam/runners/prism/internal/other.go": '// net.Listen("tcp", ":0") once\n'})
    assert prism.listeners(src) == prism.LISTENERS
    prism._check_listeners(src, "9.9.9")


@pytest.mark.parametrize("file, line", [
    ("go/pkg/beam/runners/prism/internal/worker/pool.go", 'lis, err := net.Listen("tcp", ":0")'),
    ("go/cmd/prism/debug.go", "go http.ListenAndServe(*debugAddr, nil)"),
    ("go/pkg/beam/runners/prism/internal/web/web.go", "go http.ListenAndServe(fmt.Sprintf(\":%d\", port), mux)"),
])
def test_a_listener_the_patch_does_not_bind_fails_the_build_naming_it(tmp_path, file, line):
    src = _tree(tmp_path, {})
    (src / file).parent.mkdir(parents=True, exist_ok=True)
    (src / file).write_text(f"package p\n\nfunc g() {{\n\t{line}\n}}\n")   # web.go: instead of the bound one
    with pytest.raises(SystemExit, match=rf"listens where .* does not bind it \({file}: ") as stopped:
        prism._check_listeners(src, "9.9.9")
    assert "\n" not in str(stopped.value)


def test_a_binary_is_installed_only_beside_the_patch_it_was_built_with(tmp_path, patch):
    target = tmp_path / "v9.9.9" / "prism"
    target.parent.mkdir()
    target.write_bytes(b"\x7fELF")
    assert not prism.installed(target)   # built before the patch: make prism builds it again
    (target.parent / "prism.patch").write_text(PATCH.replace("127.0.0.1", "::1"))
    assert not prism.installed(target)   # another patch
    (target.parent / "prism.patch").write_text(PATCH)
    assert prism.installed(target)
