/* tally merge (tools/cli_merge.c): the per-rank reports of one job as one
 * picture, as text or --json. */
#ifndef TALLY_CLI_MERGE_H
#define TALLY_CLI_MERGE_H

/* The command, argv[0] being "merge"; returns the exit status. */
int cli_merge_main(int argc, char **argv);

#endif /* TALLY_CLI_MERGE_H */
