"""The job service: FastAPI routes, schemas, services, persistence and settings."""
