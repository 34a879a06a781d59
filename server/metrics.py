"""Prometheus metrics: one name per concept, bounded label values (no pod or node names)."""

from __future__ import annotations

from collections import Counter as _Tally

from prometheus_client import Counter, Gauge, Histogram

from placement.cluster import ClusterState

REQUESTS = Counter("model_placement_http_requests_total", "HTTP requests served",
                   ["component", "route", "outcome"])
LATENCY = Histogram("model_placement_http_request_duration_seconds", "HTTP request latency",
                    ["component", "route"],
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
ADMISSION = Counter("model_placement_admission_decisions_total",
                    "Admission decisions by webhook, resolved policy, decision and reason",
                    ["webhook", "policy", "decision", "reason"])
REPLICA_MEMO = Counter("model_placement_mutation_replica_memo_total",
                       "/mutate answers for a pod identical to one patched lately: reused, or stale (the "
                       "policy resolution changed, so the pod was mutated afresh)", ["result"])
FILTER_NODES = Counter("model_placement_extender_filter_nodes_total",
                       "Nodes judged by /filter, by outcome", ["outcome"])
UNSYNCED = Counter("model_placement_extender_unsynced_answers_total",
                   "Extender calls refused because the cluster state was not fully listed yet, by verb", ["verb"])
PREEMPTIONS = Counter("model_placement_extender_preemptions_total",
                      "Preemption decisions: path scheduler (/preempt, per node kept or dropped) or own (our "
                      "evictions for nodes only we refused: evicted, refused by the apiserver, none possible)",
                      ["path", "result"])
RETRIES = Counter("model_placement_extender_retries_asked_total",
                  "Pods /filter turned away for want of room that the extender asked kube-scheduler to retry once "
                  "the room appeared, by result (asked, not-asked)", ["result"])
BIND = Counter("model_placement_extender_bind_total", "Bind results", ["result"])
ASSUMED_EXPIRED = Counter("model_placement_assumed_pods_expired_total",
                          "Assumed pods released because no binding was seen in time")
SYNCED = Gauge("model_placement_cache_synced", "1 once the first full list of a kind is applied", ["kind"])
WATCH_RESTARTS = Gauge("model_placement_watch_restarts", "Watch streams restarted, by kind", ["kind"])
RELISTS = Gauge("model_placement_watch_relists", "Full relists (410 Gone, CRD appeared), by kind", ["kind"])
FREE_CORES = Gauge("model_placement_free_model_cores", "Free model cores, by NUMA-count class of node",
                   ["numa_nodes"])
CAPACITY_CORES = Gauge("model_placement_model_cores", "Model core capacity, by NUMA-count class of node",
                       ["numa_nodes"])
NODES = Gauge("model_placement_nodes", "Nodes in the ledger, by NUMA-count class", ["numa_nodes"])
UNKNOWN_PLACEMENT = Gauge("model_placement_pods_of_unknown_placement",
                          "Pods in balloons of their own (model pods, and others annotated to a dedicated balloon "
                          "type) with no recorded placement nor exported balloon, counted on every NUMA node they "
                          "could use, by NUMA-count class of node", ["numa_nodes"])
CERT_NOT_AFTER = Gauge("model_placement_serving_certificate_not_after_seconds",
                       "Expiry of the serving certificate new connections get (unix time)")

_seen_classes: set[str] = set()


def refresh_ledger_totals(cluster: ClusterState) -> None:
    """Recomputed at scrape time: cheap next to a scrape interval, and never stale."""
    free: _Tally[str] = _Tally()
    cap: _Tally[str] = _Tally()
    nodes: _Tally[str] = _Tally()
    unknown: _Tally[str] = _Tally()
    for ledger in cluster.ledgers():
        cls = str(ledger.topology.numa_count)
        unknown[cls] += ledger.unsettled
        free[cls] += sum(ledger.free())
        cap[cls] += sum(ledger.capacity)
        nodes[cls] += 1
    for cls in _seen_classes | set(nodes):
        FREE_CORES.labels(cls).set(free[cls])
        CAPACITY_CORES.labels(cls).set(cap[cls])
        NODES.labels(cls).set(nodes[cls])
        UNKNOWN_PLACEMENT.labels(cls).set(unknown[cls])
    _seen_classes.update(nodes)
