"""Tests of quarry.plan (a package, so module names do not clash with other test folders)."""
