"""Training tasks: what to learn from which data. Each module turns the settings into a model, batches, a
loss and an evaluation (a :class:`~qkv.training.tasks.protocol.Task`), and shares the trainer, run directory and
checkpoints with the others.

- :mod:`~qkv.training.tasks.language_model`: a GPT predicts the next token (``--task lm``);
- :mod:`~qkv.training.tasks.translation`: an encoder-decoder translates (``--task translate``);
- :mod:`~qkv.training.tasks.word2vec`: word vectors by skip-gram or CBOW (``--task word2vec``).
"""
