"""The node's metadata: the commands that change it and the store that applies them."""
