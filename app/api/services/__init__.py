"""Service functions: what each route does, with keyword-only arguments and no HTTP in sight."""
