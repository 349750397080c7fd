"""The test suite; builders.py makes small datasets and configurations, fake_*.py stand in for servers."""
