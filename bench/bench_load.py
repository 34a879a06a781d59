"""Loading a `--cluster` file, against `json.loads` of the same file, side by side in one process.

    python bench/bench_load.py [--nodes 5000] [--pods 100000] [--repeat 3]

The file is what `kubectl get nodes,pods,balloonspolicies,noderesourcetopologies -A -o json` prints for the
fleet `bench_extender.py` measures (bench/common.py `build_fleet`). Timed, best of `--repeat`, each run on the bytes
already in memory (the page cache makes reading the file itself noise):
- `json.loads` of the file: the baseline;
- `load_cluster_file` (orjson, then the per-object checks every malformed object is named by): goal ≤ 3× the
  baseline;
- the same fleet as YAML through libyaml's C loader, and `ClusterState.from_objects` building the ledgers'
  input, for scale (no goal).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import best, build_fleet, cluster_list

GOAL = 3.0


def main(argv: list[str] | None = None) -> int:
    import orjson

    from placement.cluster import ClusterState
    from placement.config import Settings
    from server.inputs import load_cluster_file

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--yaml", action="store_true", help="also time the YAML form (minutes at full size)")
    args = p.parse_args(argv)

    objects = build_fleet(args.nodes, args.pods)
    dump = cluster_list(objects)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        path.write_text(json.dumps(dump, indent=4))  # kubectl indents by 4
        data = path.read_bytes()
        n_nodes = sum(o["kind"] == "Node" for o in objects)
        print(f"--cluster file: {n_nodes:,} nodes, {len(objects) - n_nodes:,} other objects, "
              f"{len(data) / 1e6:,.0f} MB of JSON; best of {args.repeat}")
        baseline = best(args.repeat, lambda: json.loads(data))
        parse = best(args.repeat, lambda: orjson.loads(data))
        ours = best(args.repeat, lambda: load_cluster_file(str(path)))
        loaded = load_cluster_file(str(path))
        assert not loaded.skipped and len(loaded.objects) == len(objects)
        build = best(1, lambda: ClusterState.from_objects(loaded.objects, Settings()))
        print(f"  json.loads (baseline)              {baseline:8.2f} s")
        print(f"  orjson.loads alone                 {parse:8.2f} s   (the parse inside ours)")
        print(f"  load_cluster_file (orjson + checks) {ours:7.2f} s   ratio {ours / baseline:.2f}× "
              f"(goal ≤ {GOAL:g}×: {'met' if ours <= GOAL * baseline else 'NOT met'})")
        print(f"  ClusterState.from_objects          {build:8.2f} s   (for scale: building from the loaded objects)")
        if args.yaml:
            import yaml

            ypath = Path(tmp) / "cluster.yaml"
            ypath.write_text(yaml.dump(dump, Dumper=yaml.CSafeDumper, sort_keys=False))
            yours = best(1, lambda: load_cluster_file(str(ypath)))
            print(f"  the same as YAML, libyaml C loader {yours:8.2f} s   ratio {yours / baseline:.2f}× (no goal)")
    return 0 if ours <= GOAL * baseline else 1


if __name__ == "__main__":
    sys.exit(main())
