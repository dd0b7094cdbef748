module drainfs.local/k8s-node/testbin

go 1.22
