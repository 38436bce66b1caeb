"""Peer-to-peer data plane: WebRTC data channels set up through the backbone's signaling."""
