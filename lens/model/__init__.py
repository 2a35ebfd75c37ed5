"""Models in: loading by name, folder or GGUF file (checked before anything is built), placement on devices, the
tiny random builders, the derived architecture map (``arch``) and the model card that names its sites."""
