// Stands in for a folder without sources so its library target still exists.
