"""One reader module per family of Hugging Face `model_type`s (`hf_config` registers them)."""
