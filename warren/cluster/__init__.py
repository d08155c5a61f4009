"""Clustering: nodes that share metadata through etcd and reach each other's queues."""
