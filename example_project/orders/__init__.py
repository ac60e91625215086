"""The example shop's one app: orders, and the background jobs that follow them."""
