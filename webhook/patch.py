"""RFC 6902 JSON Patch from the pod the apiserver sent to the pod it should become.

Built by hand rather than with `jsonpatch.make_patch`, to guarantee what the apiserver needs (a patch that
does not apply rejects the pod even under `failurePolicy: Ignore`):
- keys escaped per RFC 6901 (`~` -> `~0` first, then `/` -> `~1`): `…/annotations/sidecar.istio.io~1inject`;
- a missing parent is created by adding the whole object (`add /metadata/annotations {…}`), never by
  an `add` below a path that does not exist;
- no `move`/`copy`, and arrays are only extended at their end or edited in place, never reordered;
- nothing at all when nothing changes.
`checked_patch` then applies the result to the original with an independent implementation
(`jsonpatch`) and insists on getting exactly the target.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import orjson


class PatchError(ValueError):
    """The patch we built does not turn the original into the target (a bug: the caller falls back)."""


def escape(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def same(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's `==`, `true` is not `1` and `1` is not `"1"`."""
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
    """The operations that turn `src` into `dst` (JSON values; `src` is not modified)."""
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
            where = f"{path}/{escape(key)}"
            if key in src:
                _diff(src[key], value, where, ops)
            else:
                ops.append({"op": "add", "path": where, "value": copy.deepcopy(value)})
        return
    if isinstance(src, list) and isinstance(dst, list):
        common = min(len(src), len(dst))
        for i in range(common):
            _diff(src[i], dst[i], f"{path}/{i}", ops)
        for i in range(len(src) - 1, common - 1, -1):  # from the end, so indexes stay valid
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        for i in range(common, len(dst)):
            ops.append({"op": "add", "path": f"{path}/{i}", "value": copy.deepcopy(dst[i])})
        return
    if same(src, dst):
        return
    # Different types, or different scalars: the value is replaced where it stands.
    ops.append({"op": "replace", "path": path, "value": copy.deepcopy(dst)})


def apply_patch(src: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply with `jsonpatch`, a separate implementation from ours; `src` is not modified."""
    # jsonpatch's own copy is copy.deepcopy; a JSON round trip through orjson is ~10x cheaper.
    return jsonpatch.apply_patch(orjson.loads(orjson.dumps(src)), ops, in_place=True)


def checked_patch(src: Any, dst: Any) -> list[dict[str, Any]]:
    """`make_patch`, verified: applying it to `src` must give exactly `dst`."""
    ops = make_patch(src, dst)
    if not ops:
        return ops
    try:
        result = apply_patch(src, ops)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError, IndexError) as exc:
        raise PatchError(f"patch does not apply to the original: {exc}") from None
    if orjson.dumps(result, option=orjson.OPT_SORT_KEYS) != orjson.dumps(dst, option=orjson.OPT_SORT_KEYS):
        raise PatchError("patch applied to the original does not give the mutated object")
    return ops
