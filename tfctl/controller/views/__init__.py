"""What `status`, `top` and `report` show, gathered as plain data; rendered where the terminal is."""
