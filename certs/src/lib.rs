//! CA and serving certificate generation for the nodegate webhook
