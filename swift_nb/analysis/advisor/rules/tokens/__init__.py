"""The rules about what the model is fed and what its loss keeps: padding, packed rows
attended across samples, and the loss's logits."""
