//! Load generator and transport-limit baseline for the nodegate webhook.
