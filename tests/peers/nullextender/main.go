// A kube-scheduler extender that does no work: /filter passes every candidate, /prioritize states no preference.
// bench/bench_scheduler.py runs the real kube-scheduler against it to measure what calling any extender costs the
// scheduler on this machine (two HTTPS round trips per pod, ExtenderArgs encoded and answers decoded), apart from
// what our extender itself spends. Standard library only, so it builds in seconds.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
)

type args struct {
	NodeNames *[]string
}

// answer reads ExtenderArgs as an extender must, and writes what `result` makes of them.
func answer(result func(args) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var a args
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(result(a)) //nolint:errcheck
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	cert := flag.String("tls-cert", "", "serving certificate (PEM); none: plain HTTP")
	key := flag.String("tls-key", "", "its private key (PEM)")
	flag.Parse()
	http.HandleFunc("/filter", answer(func(a args) any {
		return map[string]any{"Nodes": nil, "NodeNames": a.NodeNames, "FailedNodes": map[string]string{},
			"FailedAndUnresolvableNodes": map[string]string{}, "Error": ""}
	}))
	http.HandleFunc("/prioritize", answer(func(args) any { return []any{} }))
	serve := func() error { return http.ListenAndServe(*listen, nil) }
	if *cert != "" {
		serve = func() error { return http.ListenAndServeTLS(*listen, *cert, *key, nil) }
	}
	if err := serve(); err != nil {
		fmt.Fprintln(os.Stderr, "null-extender:", err)
		os.Exit(1)
	}
}
