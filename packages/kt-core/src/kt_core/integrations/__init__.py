"""kt inside other frameworks: `kt_core.integrations.transformers` patches Hugging Face models."""
