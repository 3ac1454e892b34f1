/* remote.h: `djinn generate --server ADDR` and `djinn stat --server ADDR`,
 * the CLI commands that talk to djinnd (argv as given to main). */
#ifndef DJ_CLI_REMOTE_H
#define DJ_CLI_REMOTE_H

int dj__cli_generate(int argc, char **argv);
int dj__cli_stat(int argc, char **argv);
int dj__cli_session(int argc, char **argv); /* djinn session export|import */

#endif
