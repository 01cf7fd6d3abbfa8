"""Task-domain drafters: cheap guesses of the next tokens, verified losslessly by the target."""
