"""Clustering: Warren nodes that share metadata through etcd, tested with a real etcd cluster."""
