"""The synthetic OCR world: crops, their labels and mislabels, the tiny tokenizer and the built-in splits."""
