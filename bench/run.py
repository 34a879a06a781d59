"""Every benchmark, one after the other, each in its own process, each against a baseline it measures
in the same run (these machines are noisy: read the ratios and medians, not the absolute figures).

    python bench/run.py            # the figures quoted in docs/performance.md
    python bench/run.py --quick    # smaller sizes, a minute or two

1. webhook /mutate over TLS, 32 keep-alive clients, vs a bare aiohttp parse-and-echo handler;
2. extender /filter and /prioritize at 5,000 nodes / 100,000 pods, vs bare JSON decode + encode;
3. initial list+watch sync of 5,000 nodes / 150,000 pods through the real client, vs orjson.loads;
4. the fleet: a stream of model pods on virtual nodes behind a real control plane (the real NRI balloons plugin, or
   the real kubelet's managers and NFD's topology-updater, behind every Node), stock kube-scheduler vs
   NodeResourceTopologyMatch vs webhook + extender, judged by the nodes' cpusets (plots to docs/, not with --quick);
5. a cold `fit` per node, in process (goal: median <= 10 µs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHES: list[tuple[str, list[str], list[str]]] = [
    # name, full arguments, --quick arguments
    ("webhook /mutate over TLS", [], ["--requests", "1500"]),
    ("extender /filter + /prioritize", [], ["--quick"]),
    ("list+watch initial sync", [], ["--nodes", "1000", "--pods", "30000"]),
    ("fleet: stock vs nrt vs model-placement on virtual nodes", [],
     ["--nodes", "8", "--events", "200", "--rate", "4", "--no-plots"]),
    ("cold fit per node", [], ["--rounds", "2"]),
]
SCRIPTS = ["bench_webhook.py", "bench_extender.py", "bench_sync.py", "bench_fleet.py", "bench_fit.py"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["webhook", "extender", "sync", "fleet", "fit"])
    args = parser.parse_args()
    failed = 0
    for (name, full, quick), script in zip(BENCHES, SCRIPTS):
        if args.only and args.only not in script:
            continue
        print(f"\n=== {name} ({script}) ===", flush=True)
        started = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / script), *(quick if args.quick else full)])
        print(f"--- {name}: exit {code}, {time.perf_counter() - started:.0f} s", flush=True)
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
