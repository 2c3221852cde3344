from kdactl.entry import main

main()
