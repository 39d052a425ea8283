// Replaced by the real sandbox-init.
int main() { return 0; }
