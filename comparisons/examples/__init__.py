"""Worked examples of joker_ext in the workflows of other libraries (run them as
``python -m joker_ext.comparisons.examples.<name>``)."""
