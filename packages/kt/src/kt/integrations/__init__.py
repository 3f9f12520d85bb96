"""kt inside other frameworks: `kt.integrations.transformers` patches Hugging Face models."""
