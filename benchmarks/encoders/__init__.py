"""Offline evaluation of stair_es encoders on public image sets (see README.md here)."""
