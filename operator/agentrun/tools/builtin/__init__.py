"""Tools implemented inside the operator."""
