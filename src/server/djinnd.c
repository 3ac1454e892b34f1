/* djinnd.c: the daemon's entry point; everything else is in the server
 * library (dj__serve_main), which `djinn serve` calls too. */
#include "server/serve.h"

int main(int argc, char **argv) { return dj__serve_main(argc, argv); }
