"""What an operator runs from a laptop or a workflow, never in the serving image: publish a model
version, garbage-collect idle Versioned versions, plan a stack offline (``operations.cli``)."""
