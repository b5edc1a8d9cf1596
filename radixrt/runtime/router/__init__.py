"""Data-parallel routing: policies (plain classes) and the Ray Serve deployment that uses them."""
