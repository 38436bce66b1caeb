"""Finding collaborations on the local network (mDNS/DNS-SD with zeroconf)."""
