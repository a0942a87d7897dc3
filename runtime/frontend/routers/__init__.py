"""One router module per resource."""
