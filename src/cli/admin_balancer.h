/* admin_balancer.h: `djinn admin drain|ready|servers HOST` - a djinnd taken out of (or put
 * back into) HAProxy's rotation through HAProxy's runtime API (deploy/haproxy, docs/deploy.md). */
#ifndef DJ_CLI_ADMIN_BALANCER_H
#define DJ_CLI_ADMIN_BALANCER_H

/* argv[1] is "admin"; returns the process's exit code. */
int dj__cli_admin_balancer(int argc, char **argv);

#endif
