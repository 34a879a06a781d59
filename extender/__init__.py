"""The kube-scheduler extender: POST /filter, /prioritize, /bind and GET /debug/nodes[/NAME].

`wire` reads and writes k8s.io/kube-scheduler/extender/v1; `filter` judges candidate nodes with the core's
`cluster.fit`; `score` ranks them; `bind` assumes the cores, then binds through the API; `routes` is HTTP.
"""
