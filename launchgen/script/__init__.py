"""Plan -> script text: the Jinja render context, the script's variables, schedulers."""
