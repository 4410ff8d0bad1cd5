"""How state and batches meet devices: placements, sharding rules, padding, memory plans."""
