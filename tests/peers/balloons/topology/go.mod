module github.com/containers/nri-plugins/pkg/topology

go 1.20
