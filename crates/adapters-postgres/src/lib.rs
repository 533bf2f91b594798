//! holdfast over PostgreSQL: the backend for fleets of replicas sharing one database.
