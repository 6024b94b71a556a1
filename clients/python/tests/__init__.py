"""Tests of the graph-autofusion client SDK (a package so its module names never clash with tests/)."""
