"""Kills, restarts and long runs against real clusters, checked against a recorded history."""
