"""Tools around packages: verify, bench, conformance, inspect, and the local runners they share."""
