"""RFC 6902 JSON Patch from the pod the apiserver sent to the pod it should become.

Built by hand rather than with `jsonpatch.make_patch`, to guarantee what the apiserver needs (a patch that
does not apply rejects the pod even under `failurePolicy: Ignore`):
- keys escaped per RFC 6901 (`~` -> `~0` first, then `/` -> `~1`): `…/annotations/sidecar.istio.io~1inject`;
- a missing parent is created by adding the whole object (`add /metadata/annotations {…}`), never by
  an `add` below a path that does not exist;
- no `move`/`copy`, and arrays are only extended at their end or edited in place, never reordered;
- nothing at all when nothing changes.
`checked_patch` then applies the result to the original, with RFC 6902's strict rules (a missing parent,
member or index is an error), and insists on getting exactly the target. The applier is ours, because it
runs on every admission and copies only the containers a patch writes to; the tests hold it, and every
patch the webhook answers with, to the `jsonpatch` package's reading of the RFC.
"""

from __future__ import annotations

import re
from typing import Any


class PatchError(ValueError):
    """The patch we built does not turn the original into the target (a bug: the caller falls back)."""


def escape(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


_BAD_ESCAPE = re.compile(r"~(?![01])")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def same(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's `==`, `true` is not `1` and `1` is not `"1"`."""
    if a is b:  # a patched document shares what the patch did not touch
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def make_patch(src: Any, dst: Any) -> list[dict[str, Any]]:
    """The operations that turn `src` into `dst` (JSON values; `src` is not modified). The values in the
    operations are `dst`'s own objects, not copies: serialize the patch before changing `dst`."""
    ops: list[dict[str, Any]] = []
    _diff(src, dst, "", ops)
    return ops


def _diff(src: Any, dst: Any, path: str, ops: list[dict[str, Any]]) -> None:
    # One walk, no subtree comparisons on the way down: comparing before descending made it quadratic.
    # The mutation shares what it did not touch, so an identical object is an unchanged subtree.
    if src is dst:
        return
    if isinstance(src, dict) and isinstance(dst, dict):
        for key in src:
            if key not in dst:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in dst.items():
            if key not in src:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
            elif src[key] is not value:
                _diff(src[key], value, f"{path}/{escape(key)}", ops)
        return
    if isinstance(src, list) and isinstance(dst, list):
        common = min(len(src), len(dst))
        for i in range(common):
            if src[i] is not dst[i]:
                _diff(src[i], dst[i], f"{path}/{i}", ops)
        for i in range(len(src) - 1, common - 1, -1):  # from the end, so indexes stay valid
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        for i in range(common, len(dst)):
            ops.append({"op": "add", "path": f"{path}/{i}", "value": dst[i]})
        return
    if same(src, dst):
        return
    # Different types, or different scalars: the value is replaced where it stands.
    ops.append({"op": "replace", "path": path, "value": dst})


def apply_patch(src: Any, ops: list[dict[str, Any]]) -> Any:
    """`src` patched by `ops` (add, remove, replace) as RFC 6902 says; `src` is not modified: the
    containers on the way to each change are copied, everything else is shared."""
    root: list[Any] = [src]  # a parent for the document itself, whose path is ""
    copied: set[int] = set()
    for n, op in enumerate(ops):
        kind, path = op.get("op"), op.get("path")
        if kind not in ("add", "remove", "replace") or not isinstance(path, str):
            raise PatchError(f"operation {n}: {kind!r} at {path!r} is not an add, remove or replace with a path")
        if not path:  # the whole document: add and replace put the value in its place
            if kind == "remove" or "value" not in op:
                raise PatchError(f"operation {n}: {kind} of the whole document needs a value to replace it")
            root[0] = op["value"]
            continue
        if not path.startswith("/"):
            raise PatchError(f"operation {n}: path {path!r} does not start with /")
        parent: Any = root
        key: Any = 0
        for token in path.split("/")[1:]:
            if "~" in token and _BAD_ESCAPE.search(token):
                raise PatchError(f"operation {n}: {token!r} in {path!r} has a ~ not followed by 0 or 1 (RFC 6901)")
            parent = _own(parent, key, copied, n, path)
            key = _member(parent, unescape(token), n, path)
        _apply_one(parent, key, kind, op, n, path)
    return root[0]


def _own(parent: Any, key: Any, copied: set[int], n: int, path: str) -> Any:
    """The child `parent[key]`, made a copy of its own (once) so that writing to it spares the original."""
    try:
        child = parent[key]
    except (KeyError, IndexError):
        raise PatchError(f"operation {n}: {path!r} goes through a member that does not exist") from None
    if id(child) not in copied:
        if isinstance(child, dict):
            child = dict(child)
        elif isinstance(child, list):
            child = list(child)
        else:
            raise PatchError(f"operation {n}: {path!r} goes through a {type(child).__name__}")
        parent[key] = child
        copied.add(id(child))
    return child


def _member(container: Any, token: str, n: int, path: str) -> Any:
    if isinstance(container, dict):
        return token
    if token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"operation {n}: {token!r} in {path!r} is not an array index")
    return int(token)


def _apply_one(parent: Any, key: Any, kind: str, op: dict[str, Any], n: int, path: str) -> None:
    if isinstance(parent, dict):
        exists = key in parent
    else:
        exists = key < len(parent)
        if kind == "add" and key > len(parent):
            raise PatchError(f"operation {n}: index {key} is past the end of the array at {path!r}")
    if kind != "add" and not exists:
        raise PatchError(f"operation {n}: {kind} of {path!r}, which does not exist")
    if kind == "remove":
        del parent[key]
        return
    if "value" not in op:
        raise PatchError(f"operation {n}: {kind} of {path!r} has no value")
    if kind == "add" and isinstance(parent, list):
        parent.insert(key, op["value"])
    else:
        parent[key] = op["value"]


def checked_patch(src: Any, dst: Any) -> list[dict[str, Any]]:
    """`make_patch`, verified: applying it to `src` must give exactly `dst`."""
    ops = make_patch(src, dst)
    if ops and not same(apply_patch(src, ops), dst):
        raise PatchError("patch applied to the original does not give the mutated object")
    return ops
