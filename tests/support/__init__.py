"""Test support: a local stand-in for the Kubernetes apiserver (list/watch/bind wire format)."""
