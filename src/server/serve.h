/* serve.h: the daemon's main for djinnd and `djinn serve` (argv as given to
 * main; a leading "serve" word is skipped). */
#ifndef DJ_SERVE_H
#define DJ_SERVE_H

int dj__serve_main(int argc, char **argv);

#endif
