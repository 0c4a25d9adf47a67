//! kube-sim: an in-memory Kubernetes API server for tests (see issue "kube-sim").
