"""Test-only stand-ins and helpers shared across the suite; never imported by product code."""
