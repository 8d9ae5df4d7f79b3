"""The study store: Optuna storage, trial records, and what may be shown of a storage URL."""
