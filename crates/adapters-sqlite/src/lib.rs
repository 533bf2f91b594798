//! holdfast over SQLite: the embedded default backend for tokens, locks, transaction statuses and queues.
