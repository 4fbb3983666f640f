#!/bin/bash
cd /srv/project
tree -a --noreport --charset ascii src > TREE.txt
